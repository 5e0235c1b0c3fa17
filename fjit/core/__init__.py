"""The IR every stage shares: values and bound symbols (ir.py), traces (trace.py) and the functions
made from generated source (generated.py), the prims (prims/), what torch decides about values
without computing them (meta.py), and symbolic sizes (symbolic.py).  Nothing here imports the
frontend, the decompositions, a pass or an executor."""

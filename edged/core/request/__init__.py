"""A request on its way through the core: the objects frontends build (inference.py), their validation against a
model (validation.py), tensors in their wire forms (tensors.py, datatypes.py) and classification outputs."""

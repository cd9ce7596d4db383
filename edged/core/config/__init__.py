"""Model configurations: config.pbtxt parsed with protobuf's text format (model_config.py), the defaults Triton
fills in (defaults.py) and the checks a config must pass (validation.py)."""

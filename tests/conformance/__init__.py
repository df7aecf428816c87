"""E2B SDK conformance suite: the official e2b / e2b_code_interpreter SDKs
against a real cellfork daemon (fixtures in tests/conftest.py)."""

"""Personas: who the assistant is (one TOML file each) and the store that reads them."""

"""Helpers the tests share: fakes, stand-ins, model and file makers. Test modules import only these."""

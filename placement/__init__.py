"""gpufed.placement: pure placement over a frozen fleet snapshot (no I/O, no clock, no logging).

Imports only ``gpufed.api``.
"""

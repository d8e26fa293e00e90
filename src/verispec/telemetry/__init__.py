"""Measurements that every layer may take: wall clocks, the energy meter and PEARL's
busy/idle timeline."""

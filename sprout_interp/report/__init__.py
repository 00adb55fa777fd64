"""What the claim scripts in ``analyses/`` share: loading models by name, held-out samples, printing tables
and writing figures (``cli``).

May import: everything in ``sprout_interp``.
"""

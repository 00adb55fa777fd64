"""What the chapter says about Sprout's parts, computed from a config: parameter counts per part (``params``)
and the RoPE maths behind the positions page (``rope``).

May import: ``sprout_model`` and ``sprout_interp.core``.
"""

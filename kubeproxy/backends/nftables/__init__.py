"""nftables mode: `render` (pure) builds the table as objects, `NftApplier` diffs and loads it.

See render.py for the layout and the endpoint-selection design, apply.py for how changes reach
the kernel.
"""

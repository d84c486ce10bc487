"""evalkit: replays agent scenarios through toolsentry and measures the damage a flat score hides."""

"""smolalign: rewards."""

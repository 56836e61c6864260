"""smolalign: data_gen."""

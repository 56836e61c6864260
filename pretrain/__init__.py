"""smolalign: pretrain."""

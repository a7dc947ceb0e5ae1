"""The hardware layer: the GPU catalog and how GPU names, labels and instance types resolve."""

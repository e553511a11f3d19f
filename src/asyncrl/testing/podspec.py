"""Moved to asyncrl.launch.podspec (local mode runs pod specs as processes too); this name stays for tests."""

from asyncrl.launch.podspec import Image, ImageTable, container_argv, expand_references, map_paths, pod_field

__all__ = ["Image", "ImageTable", "container_argv", "expand_references", "map_paths", "pod_field"]

"""The recipes: each folder holds its manifest, patches, launchers, recipe files and recipe-only tools."""

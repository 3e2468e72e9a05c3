"""Page modules: each has render(root, inventory)."""

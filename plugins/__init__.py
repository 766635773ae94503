"""Built-in plugins, one file each; installed as the `latencyd.plugins` package."""

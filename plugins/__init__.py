"""Built-in plugins, a module or a package each; installed as the `latencyd.plugins` package."""

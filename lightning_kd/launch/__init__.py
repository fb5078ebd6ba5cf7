"""The wiring: composing the config, resolving `auto` settings once, checking values before anything
loads, building the objects, and the library half of each command."""

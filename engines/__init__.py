"""Query engines and their plugin host. Nothing in this package imports Django.

``engines.plugins`` is the one place that builds the pluggy ``PluginManager``; the
contract is ``engines.hookspecs``; the value types passed across it are in
``engines.types``. Built-in engines are plugins like any other.
"""

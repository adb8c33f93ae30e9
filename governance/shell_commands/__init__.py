"""Management commands that replace a library's own of the same name. Django runs the
command of the first app in INSTALLED_APPS that has one, so this app comes before
``rest_framework.authtoken`` (the project's other commands live in ``governance``, which
comes last)."""

from django.apps import AppConfig


class ShellCommandsConfig(AppConfig):
    name = "governance.shell_commands"
    label = "governance_shell_commands"
    verbose_name = "Governance shell commands"

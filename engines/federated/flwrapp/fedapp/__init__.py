"""Flower entry points of the federated engine (see engines/federated/flwr_apps.py)."""

from engines.federated.flwr_apps import client_app

app = client_app

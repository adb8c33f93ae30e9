from engines.federated.flwr_apps import server_app

app = server_app

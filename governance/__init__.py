"""The privacy-budget governance service: Django project and app in one package."""

"""``python -m rankscope`` runs the CLI."""

from rankscope.cli.main import app

if __name__ == "__main__":
    app()

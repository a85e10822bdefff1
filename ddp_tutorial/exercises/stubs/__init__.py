"""Made from ``exercises/solutions`` by ``python -m ddp_tutorial.exercises.stubgen``: do not edit."""

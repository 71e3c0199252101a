"""The five built-in strategies (seed 002, "Sandbox Strategies")."""

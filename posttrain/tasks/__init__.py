"""Embedded tasks: synthetic data posttrain can generate offline (arithmetic, toy code)."""

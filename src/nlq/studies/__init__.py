"""Studies and their reports: statistics, tables and plots on top of run directories."""

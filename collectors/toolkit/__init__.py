"""The code collectors share (the full description comes with the package's last move)."""

"""One module per dashboard, each with its board() and a function per section of panels;
dashboards/build.py lists them in the order Grafana's dashboard list links them."""

//! Load generator, capacity-model backend and scenario runner.

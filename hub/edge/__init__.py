"""The hub process and its transport edge: wiring, gRPC servicer, HTTP, leader election."""

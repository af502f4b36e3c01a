"""One leader term: the Controller, the Term and its state, the components it builds."""

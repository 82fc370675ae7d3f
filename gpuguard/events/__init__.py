"""Events: the typed event model, its JSON form and its wire format."""

"""Static facts that rules share: qualified names, name kinds, training loops."""

"""The Ray layer, in rooms that import one way (docs/ARCHITECTURE.md): cluster <- train <- inference <- ensemble."""

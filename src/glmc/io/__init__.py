"""Reading and writing model folders, checkpoints and reports safely."""

"""What generation adds to fairseq's: the paper's unknown-word replacement."""

"""The answer first: what the step loses that a pipeline user can change, and the change worth making."""

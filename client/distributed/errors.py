"""What the neuron process group raises."""


class CollectiveError(RuntimeError):
    """A collective could not run: the message names the collective, the group and what to do."""

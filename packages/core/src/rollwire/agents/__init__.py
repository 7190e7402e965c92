"""Agent adapters that live in core (the plain OpenAI client); others are separate distributions."""

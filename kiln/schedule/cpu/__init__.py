"""CPU schedules (target family ``"c"``): registered into the op registry on import."""

"""Default schedules per target (``kiln.schedule.gpu``: generic GPU rules)."""

x = 1   # defines no rule

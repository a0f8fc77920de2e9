raise RuntimeError('no rule today')

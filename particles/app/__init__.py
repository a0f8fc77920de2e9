"""The application layer: runs, sweeps, reproduction, the command line.

The only code that imports the engine core (particles), scenes and render together.
"""

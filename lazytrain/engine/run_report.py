"""Moved: the plots and the `PlotWriter` hook are in `lazytrain.engine.plot_writer`; the run header and
closing summary in `lazytrain.program.run_report`. This module keeps ``lazytrain.engine.run_report.PlotWriter``
(named in configs saved by earlier versions) working."""

from lazytrain.engine.plot_writer import PlotWriter, write_run_plots, write_sweep_plots

__all__ = ["PlotWriter", "write_run_plots", "write_sweep_plots"]

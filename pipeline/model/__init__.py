"""Model families (one module per ``model.architecture``) and checkpoint contents."""

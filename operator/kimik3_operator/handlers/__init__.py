"""The kopf handlers (thin) and the reconcile they share."""

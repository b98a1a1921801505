"""What a run leaves behind: the record schemas and their JSON-lines files (results),
where a result came from (provenance), and the fields every record starts with (build)."""

// Placeholder translation unit until the sessions library lands.

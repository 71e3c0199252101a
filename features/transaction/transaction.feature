Feature: Transaction sandbox lifecycle (strategy "transaction_rollback")
  As a plan author
  I want database writes held in one transaction until the plan is applied
  So that COMMIT applies them all at once and ROLLBACK discards them (seed 002, TransactionSandbox)

  # Every outline runs on the embedded default (SQLite) and on a real PostgreSQL server.

  # --- Creation ---

  Scenario Outline: Create a transaction sandbox
    Given a txn <backend> database with an empty "items" table
    When a txn sandbox is created for plan "plan-001"
    Then the txn sandbox should be in the "created" state
    And the txn sandbox context should reference plan "plan-001"
    And the txn sandbox context should have strategy metadata "transaction_rollback"
    And the txn sandbox context should have backend metadata "<backend_id>"
    And the txn statement log should exist and be empty

    Examples: embedded
      | backend | backend_id |
      | SQLite  | sqlite     |

    @postgres
    Examples: server
      | backend    | backend_id |
      | PostgreSQL | postgresql |

  Scenario: Creating a transaction sandbox with empty plan_id raises ValueError
    Given a txn SQLite database with an empty "items" table
    When a txn sandbox is created with empty plan_id
    Then a txn ValueError should be raised with message "plan_id cannot be empty"

  Scenario: Creating a transaction sandbox with empty resource_id raises ValueError
    Given a txn SQLite database with an empty "items" table
    When a txn sandbox is prepared with empty resource_id
    Then a txn ValueError should be raised with message "resource_id cannot be empty"

  Scenario: Creating a transaction sandbox with empty original_path raises ValueError
    Given a txn SQLite database with an empty "items" table
    When a txn sandbox is prepared with empty original_path
    Then a txn ValueError should be raised with message "original_path cannot be empty"

  Scenario: Creating a transaction sandbox on a non-existent database file raises SandboxCreationError
    Given a txn SQLite database with an empty "items" table
    When a txn sandbox is created on "missing.db" for plan "plan-001"
    Then a txn SandboxCreationError should be raised mentioning "no SQLite database file"
    And the txn sandbox should be in the "errored" state
    And the txn file "missing.db" should not exist

  Scenario: Creating a transaction sandbox on a file that is not a database raises SandboxCreationError
    Given a txn SQLite database with an empty "items" table
    And a txn plain file "notes.txt" containing "not a database"
    When a txn sandbox is created on "notes.txt" for plan "plan-001"
    Then a txn SandboxCreationError should be raised mentioning "file is not a database"
    And the txn sandbox should be in the "errored" state

  Scenario: Creating a transaction sandbox on an unsupported database URL raises SandboxCreationError
    Given a txn SQLite database with an empty "items" table
    When a txn sandbox is created on "mysql://db.example/app" for plan "plan-001"
    Then a txn SandboxCreationError should be raised mentioning "unsupported database URL scheme 'mysql'"

  Scenario: Creating a transaction sandbox on an in-memory database raises SandboxCreationError
    Given a txn SQLite database with an empty "items" table
    When a txn sandbox is created on ":memory:" for plan "plan-001"
    Then a txn SandboxCreationError should be raised mentioning "in-memory SQLite database cannot be sandboxed"

  @postgres
  Scenario: Creating a transaction sandbox on an unreachable server raises SandboxCreationError
    Given a txn PostgreSQL database with an empty "items" table
    When a txn sandbox is created on "postgresql://sandbox:s3cret@127.0.0.1:1/nowhere" for plan "plan-001"
    Then a txn SandboxCreationError should be raised mentioning "127.0.0.1"
    And the txn error should not mention "s3cret"
    And the txn sandbox should be in the "errored" state

  Scenario: A sqlite URL names the same database as its path
    Given a txn SQLite database with an empty "items" table
    When a txn sandbox is created through a sqlite URL for plan "plan-001"
    And txn row "alpha" is inserted through the sandbox
    And the txn sandbox is committed
    Then the txn original "items" table should hold "alpha"

  # --- Path resolution ---

  Scenario Outline: get_path resolves inside the sandbox's scratch directory
    Given a txn <backend> database with an empty "items" table
    When a txn sandbox is created for plan "plan-001"
    And the txn path "exports/report.csv" is resolved
    Then the txn resolved path should be inside the scratch directory
    And the txn sandbox should be in the "active" state

    Examples: embedded
      | backend |
      | SQLite  |

    @postgres
    Examples: server
      | backend    |
      | PostgreSQL |

  Scenario: Path traversal is rejected
    Given a txn SQLite database with an empty "items" table
    When a txn sandbox is created for plan "plan-001"
    And the txn path "../etc/passwd" is resolved
    Then a txn ValueError should be raised with message "Path traversal not allowed"

  Scenario: Resolving a path on a cleaned-up sandbox raises SandboxStateError
    Given a txn SQLite database with an empty "items" table
    When a txn sandbox is created for plan "plan-001"
    And the txn sandbox is cleaned up
    And the txn path "file.txt" is resolved
    Then a txn SandboxStateError should be raised

  # --- Writes and isolation ---

  Scenario Outline: Writes are visible in the sandbox and invisible in the original until commit
    Given a txn <backend> database with an empty "items" table
    When a txn sandbox is created for plan "plan-001"
    And txn row "alpha" is inserted through the sandbox
    And txn row "beta" is inserted through the sandbox
    Then the txn sandbox should be in the "active" state
    And the txn sandbox should read "alpha,beta" from "items"
    And the txn original "items" table should be empty
    And the txn statement log should hold 2 statements

    Examples: embedded
      | backend |
      | SQLite  |

    @postgres
    Examples: server
      | backend    |
      | PostgreSQL |

  Scenario Outline: A failing statement is undone alone and the sandbox stays usable
    Given a txn <backend> database with an empty "items" table
    When a txn sandbox is created for plan "plan-001"
    And txn row "alpha" is inserted through the sandbox
    And a txn NULL row is inserted through the sandbox
    Then a txn SandboxStatementError should be raised for a constraint
    And the txn sandbox should be in the "active" state
    When txn row "beta" is inserted through the sandbox
    And the txn sandbox is committed
    Then the txn original "items" table should hold "alpha,beta"
    And the txn commit result should count 2 statements

    Examples: embedded
      | backend |
      | SQLite  |

    @postgres
    Examples: server
      | backend    |
      | PostgreSQL |

  Scenario: Transaction control statements are refused
    Given a txn SQLite database with an empty "items" table
    When a txn sandbox is created for plan "plan-001"
    And the txn statement "COMMIT" is attempted through the sandbox
    Then a txn SandboxStatementError should be raised mentioning "use commit() or rollback()"

  # --- Commit ---

  Scenario Outline: Commit makes the writes visible to other connections
    Given a txn <backend> database with an empty "items" table
    When a txn sandbox is created for plan "plan-001"
    And txn row "alpha" is inserted through the sandbox
    And txn row "beta" is inserted through the sandbox
    And the txn sandbox is committed with message "apply plan-001"
    Then the txn commit result should indicate success
    And the txn commit result should count 2 statements
    And the txn commit metadata should contain message "apply plan-001"
    And the txn sandbox should be in the "committed" state
    And the txn original "items" table should hold "alpha,beta"
    And the txn commit should have landed

    Examples: embedded
      | backend |
      | SQLite  |

    @postgres
    Examples: server
      | backend    |
      | PostgreSQL |

  Scenario Outline: Commit with no statements produces an empty result
    Given a txn <backend> database with an empty "items" table
    When a txn sandbox is created for plan "plan-001"
    And the txn sandbox is committed
    Then the txn commit result should indicate success
    And the txn commit result should count 0 statements
    And the txn original "items" table should be empty
    And the txn commit should have landed

    Examples: embedded
      | backend |
      | SQLite  |

    @postgres
    Examples: server
      | backend    |
      | PostgreSQL |

  Scenario Outline: A failing COMMIT leaves the original untouched and the sandbox errored
    Given a txn <backend> database with an empty "items" table
    When a txn sandbox is created for plan "plan-001"
    And txn row "alpha" is inserted through the sandbox
    And the txn COMMIT statement is made to fail
    And the txn sandbox commit is attempted
    Then a txn SandboxCommitError should be raised
    And the txn sandbox should be in the "errored" state
    And the txn original "items" table should be empty
    And the txn commit should not have landed

    Examples: embedded
      | backend |
      | SQLite  |

    @postgres
    Examples: server
      | backend    |
      | PostgreSQL |

  Scenario: Commit on a cleaned-up sandbox raises SandboxStateError
    Given a txn SQLite database with an empty "items" table
    When a txn sandbox is created for plan "plan-001"
    And the txn sandbox is cleaned up
    And the txn sandbox commit is attempted
    Then a txn SandboxStateError should be raised

  # --- Rollback ---

  Scenario Outline: Rollback discards the writes
    Given a txn <backend> database with an empty "items" table
    When a txn sandbox is created for plan "plan-001"
    And txn row "alpha" is inserted through the sandbox
    And the txn sandbox is rolled back
    Then the txn sandbox should be in the "rolled_back" state
    And the txn original "items" table should be empty
    And the txn statement log should exist and be empty
    And the txn sandbox should read nothing from "items"

    Examples: embedded
      | backend |
      | SQLite  |

    @postgres
    Examples: server
      | backend    |
      | PostgreSQL |

  Scenario Outline: A rolled-back sandbox is re-used and commits only the new writes
    Given a txn <backend> database with an empty "items" table
    When a txn sandbox is created for plan "plan-001"
    And txn row "alpha" is inserted through the sandbox
    And the txn sandbox is rolled back
    And txn row "beta" is inserted through the sandbox
    Then the txn sandbox should be in the "active" state
    When the txn sandbox is committed
    Then the txn original "items" table should hold "beta"

    Examples: embedded
      | backend |
      | SQLite  |

    @postgres
    Examples: server
      | backend    |
      | PostgreSQL |

  Scenario Outline: Rollback after commit is refused
    Given a txn <backend> database with an empty "items" table
    When a txn sandbox is created for plan "plan-001"
    And txn row "alpha" is inserted through the sandbox
    And the txn sandbox is committed
    And the txn sandbox rollback is attempted
    Then a txn SandboxStateError should be raised mentioning "cannot be rolled back after commit"
    And the txn sandbox should be in the "committed" state
    And the txn original "items" table should hold "alpha"

    Examples: embedded
      | backend |
      | SQLite  |

    @postgres
    Examples: server
      | backend    |
      | PostgreSQL |

  Scenario: Rollback on a non-active sandbox raises SandboxStateError
    Given a txn SQLite database with an empty "items" table
    When a txn sandbox is created for plan "plan-001"
    And the txn sandbox rollback is attempted
    Then a txn SandboxStateError should be raised

  Scenario: Statements on a committed sandbox raise SandboxStateError
    Given a txn SQLite database with an empty "items" table
    When a txn sandbox is created for plan "plan-001"
    And the txn sandbox is committed
    And the txn statement "DELETE FROM items" is attempted through the sandbox
    Then a txn SandboxStateError should be raised

  # --- Cleanup ---

  Scenario Outline: Cleanup removes the scratch directory and keeps the original
    Given a txn <backend> database with an empty "items" table
    When a txn sandbox is created for plan "plan-001"
    And txn row "alpha" is inserted through the sandbox
    And the txn sandbox is committed
    And the txn sandbox is cleaned up
    And the txn sandbox is cleaned up
    Then the txn sandbox should be in the "cleaned_up" state
    And the txn scratch directory should not exist
    And the txn original "items" table should hold "alpha"

    Examples: embedded
      | backend |
      | SQLite  |

    @postgres
    Examples: server
      | backend    |
      | PostgreSQL |

  # --- Living next to the application (issue 7: cases 31 and 32) ---

  Scenario Outline: The application writes between the sandbox's statements without waiting
    Given a txn <backend> database with an empty "items" table
    And the txn database journal mode is "<mode>"
    When a txn sandbox is created for plan "plan-001"
    And the txn sandbox reads "items"
    And the txn application inserts "app" without waiting
    And txn row "alpha" is inserted through the sandbox
    And the txn application inserts "app2" without waiting
    And txn row "beta" is inserted through the sandbox
    And the txn sandbox is committed
    Then the txn original "items" table should hold "alpha,app,app2,beta"

    Examples: embedded
      | backend | mode   |
      | SQLite  | wal    |
      | SQLite  | delete |

    @postgres
    Examples: server
      | backend    | mode   |
      | PostgreSQL | server |

  Scenario Outline: A replay that would change an id the sandbox saw is refused and changes nothing
    Given a txn <backend> database with a "parent" table with generated ids
    When a txn sandbox is created for plan "plan-001"
    And the txn sandbox inserts parent "agent" and sees id 1
    And the txn sandbox is closed
    And the txn application inserts parent "app"
    And the txn sandbox commit is attempted
    Then a txn SandboxReplayDivergedError should be raised naming statement 1
    And the txn sandbox should be in the "active" state
    And the txn original "parent" table should hold "app"
    And the txn commit should not have landed

    Examples: embedded
      | backend |
      | SQLite  |

    @postgres
    Examples: server
      | backend    |
      | PostgreSQL |

  # --- Restart: another process takes over ---

  Scenario Outline: A sandbox reopened in another process replays its writes and commits them
    Given a txn <backend> database with an empty "items" table
    When a txn child process creates a sandbox for plan "plan-restart" inserting "alpha" and dies
    Then the txn original "items" table should be empty
    When a txn child process reopens the sandbox, inserts "beta" and commits
    Then the txn child process should have read "alpha" before its insert
    And the txn original "items" table should hold "alpha,beta"
    And the txn stored sandbox should be in the "committed" state

    Examples: embedded
      | backend |
      | SQLite  |

    @postgres
    Examples: server
      | backend    |
      | PostgreSQL |

  Scenario Outline: A commit that landed before a crash is not applied twice
    Given a txn <backend> database with an empty "items" table
    When a txn child process creates a sandbox for plan "plan-crash" inserting "alpha" and dies
    And a txn child process reopens the sandbox, commits and dies before saving its status
    Then the txn stored sandbox should be in the "active" state
    When the txn stored sandbox is reopened here
    Then the txn commit should have landed
    When the txn sandbox is committed
    Then the txn commit result should indicate success
    And the txn commit result should say it was already committed
    And the txn sandbox should be in the "committed" state
    And the txn original "items" table should hold "alpha"

    Examples: embedded
      | backend |
      | SQLite  |

    @postgres
    Examples: server
      | backend    |
      | PostgreSQL |

  # --- Protocol properties ---

  Scenario: Transaction sandbox has a unique ULID identifier and cannot undo a commit
    Given a txn SQLite database with an empty "items" table
    When a txn sandbox is instantiated
    Then the txn sandbox_id should be a valid ULID
    And the txn sandbox status should be "pending"
    And the txn sandbox context should be None
    And the txn sandbox should satisfy the Sandbox protocol without being rollbackable
